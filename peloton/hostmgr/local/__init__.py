"""hostmgr/local"""
