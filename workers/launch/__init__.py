"""Starting and stopping processes: the worker launcher, its process groups, process identity, `mxq
up`/`mxq down`, and who holds a port.
"""
