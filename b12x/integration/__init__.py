"""Engine adapters: thin, engine-shaped entry points over b12x's plan/bind/run facades."""
