from batchspec.cli import main

main()
