"""malt"""
