"""The course machinery: exercise generation and the checkers learners call."""
