"""One pyinfra role per layer of the stack; deploy.py calls them in order."""
