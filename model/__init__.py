"""The pure model of millstream: state machines that mirror the TLA+ specs action for action."""
