"""Recorded training traces: readers for formats that other tools publish, turned into FlopWatch's phases."""
