"""What every part of rpcctl may import, the rank side included: the error hierarchy, the state
machines' words, files written owner-only, linear-time regexes, stack dumps, /proc readings.
The standard library only, but for what a module says it needs; nothing here imports another
folder of rpcctl.
"""
