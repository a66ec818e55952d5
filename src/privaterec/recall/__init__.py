"""privaterec.recall"""
