"""How a tool runs: models and their data as subjects (`features`), the cost of each
pass priced before it runs (`estimate`), progress lines and the time limit's stop
(`progress`, `stopping`), the training objectives the curvature tools measure
(`objectives`) and sparse autoencoders' files (`sae_files`)."""
