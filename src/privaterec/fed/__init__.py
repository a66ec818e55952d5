"""privaterec.fed"""
