"""The lab: misbehaving servers on loopback and the experiments that use them."""
