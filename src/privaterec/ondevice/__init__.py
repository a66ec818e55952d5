"""What a device computes and downloads: its release of one query and the pool's wire format.

The device SDK (:mod:`privaterec.serving`) and the offline evaluation (:mod:`privaterec.eval`)
both build on these modules, so they sit below both.
"""
