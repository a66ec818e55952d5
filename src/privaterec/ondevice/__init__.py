"""What a device computes and downloads: its release of one query, the pool's wire format,
and its privacy account (ledger, finite budget, re-release limit: :mod:`.budget`).

The device SDK (:mod:`privaterec.serving`) and the offline evaluation (:mod:`privaterec.eval`)
both build on these modules, so they sit below both.
"""
