"""The command groups of `peloton`, a module each (several small groups share one): each has
`register(name, parser)`, which adds the group's commands to the group's parser. Light imports only: a group's
module is imported whenever its group is on the command line (peloton/cli/parser.py)."""
