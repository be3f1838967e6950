"""The bottom of the package: durable writes, one lock, and the checks of the files a command is
told to read or write. The standard library only; every layer may import it."""
