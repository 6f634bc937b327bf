"""Pictures: one module per lesson. Techniques never draw; notebooks and the tour do.

Every function returns a matplotlib Figure and shows nothing itself.
"""
