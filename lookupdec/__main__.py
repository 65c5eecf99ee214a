"""`python -m lookupdec ...`: the same as the `lookupdec` command."""
from lookupdec.cli import main

if __name__ == "__main__":
    main()
