"""Applications on top of the run layer, next to the command line: the Flower App behind
``flwr run flower/`` (:mod:`.flower_app`)."""
