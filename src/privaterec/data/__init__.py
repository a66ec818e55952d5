"""privaterec.data"""
