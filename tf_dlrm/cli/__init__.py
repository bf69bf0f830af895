"""``main.py``'s edge: flags parsed once into configs, the modes, the process set-up."""
