"""The house rules: folders by concept, SQL only in db/, one import name, a fast CLI, docs that run."""
