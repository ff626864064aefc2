"""How an analysis runs: the command line's request (`request`) and the command
(`command`: the models it names, `loading`; the output folder, `out_folder`), models
and their data as subjects (`features`), the cost of each tool priced before it runs
(`estimate`), the plan that fits the tools into a time budget (`planning`), progress
lines (`progress`), the training objectives the curvature tools measure
(`objectives`) and sparse autoencoders' files (`sae_files`)."""
