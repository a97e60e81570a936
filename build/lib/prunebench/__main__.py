from prunebench.cli import main

main()
