"""What the engine is sent, decided from the units' outcomes: pure functions.

:mod:`rules` makes the engine's decision of a filter, score or balance call (intersection in input order,
foreign IDs dropped and reported, balance always ``[vm or "", [hosts]]``); :mod:`weights` turns score units'
real numbers into the bounded integers the engine ranks in the exact order of the real totals. The gateway
answers the engine with them; a replay and a shadow candidate decide with the same code.
"""
