"""The optimizer core: ``FlexDeMo``, its exchange engine and modes, the plan, the arithmetic and the guards; torch
only."""
