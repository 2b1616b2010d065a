"""Hardware and its cost formulas, free of any trace: the device catalog, the roofline and
Habitat scaling, interconnect topologies, collective algorithms, PIM devices. Transforms and
predictors both import it; it imports only :mod:`whatif.core`."""
