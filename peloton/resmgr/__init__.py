"""resmgr"""
