from prunebench.commands import prunebench

prunebench()
