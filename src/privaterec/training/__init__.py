"""privaterec.training"""
