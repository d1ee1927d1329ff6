"""`intellect devnet`: the whole network on one machine, on embedded defaults."""
