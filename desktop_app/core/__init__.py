"""The science: models, traces, attention, generation, Lipschitz, features, graphs, training. No Qt here."""
