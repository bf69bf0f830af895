"""Writing outputs safely: staged in a temporary sibling, published by a rename, never over foreign files."""
