"""Hardware challenges: the challenger (challenger.py) and the loop that challenges the pool's members
again at random times (rechecks.py)."""
