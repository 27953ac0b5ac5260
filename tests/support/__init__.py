"""Test machinery: systemd test hosts and recorded hosts. Not in the wheel."""
