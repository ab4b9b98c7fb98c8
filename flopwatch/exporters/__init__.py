"""The node agent (`flopwatch agent`) and its collectors."""
