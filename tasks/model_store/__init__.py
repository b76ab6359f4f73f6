"""The model store: built-in architectures, imported and registered versions, and their checksums."""
