"""jobmgr"""
