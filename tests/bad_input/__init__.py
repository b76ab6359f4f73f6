"""Bad input of every kind refused in one line naming what, which value and what is allowed."""
