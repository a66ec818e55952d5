"""privaterec.serving"""
