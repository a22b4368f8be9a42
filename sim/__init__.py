"""A discrete-event simulator of Breakwater at seed scale: the blueprint's own policy code in virtual time."""
