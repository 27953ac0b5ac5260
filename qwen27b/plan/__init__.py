"""Pure planning: facts and the stack file in, decisions out. No pyinfra, no host I/O."""
