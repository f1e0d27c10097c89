from feedproc.cli import main

main()
