from rpcctl.cli import main

main()
