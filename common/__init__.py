"""The bottom of the package: the errors every layer raises (``errors.py``), durable writes and
the one lock (``durability.py``), and the checks of the files a command is told to read or write
(``user_files.py``). The standard library only; every layer may import it."""
