from mxq.cli.main import main

main()
