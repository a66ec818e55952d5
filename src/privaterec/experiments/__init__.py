"""privaterec.experiments"""
