from c128patch.cli import main

main()
