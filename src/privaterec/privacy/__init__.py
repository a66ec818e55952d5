"""privaterec.privacy"""
