from blindheads.cli import main

main()
