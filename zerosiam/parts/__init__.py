"""Small, separately tested parts that methods are assembled from."""
