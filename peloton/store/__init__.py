"""The store: one narrow interface over plain domain types (peloton/domain/model.py).

ORM rows never leave this package. Callers own the transaction: every function in repo.py takes a
Session and never commits; use `db.transaction(sessions)` to get one.
"""
