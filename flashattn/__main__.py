from .runtime import describe

print(describe())
