from fedgmr.cli import main

main()
