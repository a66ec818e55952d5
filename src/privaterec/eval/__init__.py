"""privaterec.eval"""
