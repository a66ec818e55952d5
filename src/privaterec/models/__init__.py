"""privaterec.models"""
