"""placeholder"""
def setup(app):
    pass
