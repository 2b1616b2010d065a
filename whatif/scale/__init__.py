"""Scale-out (issue 15): jobs of many ranks analyzed rank-parallel (:mod:`.job`, :mod:`.group`,
:mod:`.pool`) on local processes or Ray."""
