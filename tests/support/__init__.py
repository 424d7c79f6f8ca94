"""Models, graphs and checks shared by the tests (imported as ``tests.support``)."""
